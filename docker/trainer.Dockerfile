# The trainer image: the demo training loop on the CPU, with torch.
ARG BASE_IMAGE=python:3.11-slim
ARG TORCH_SPEC="torch>=2.1"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
FROM ${BASE_IMAGE}
ARG TORCH_SPEC
ARG TORCH_INDEX
WORKDIR /app
COPY pyproject.toml README.md ./
COPY common common
COPY producer producer
COPY consumer consumer
COPY ferry ferry
RUN python -m pip install --no-cache-dir "${TORCH_SPEC}" --index-url "${TORCH_INDEX}" \
    || python -m pip install --no-cache-dir "${TORCH_SPEC}"
RUN python -m pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "ferry"]
