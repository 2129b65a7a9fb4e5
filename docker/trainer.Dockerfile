# The trainer image: the demo training loop on the CPU, with torch.
# TORCH_SPEC may name a wheel in docker/wheels/torch (copied to /wheels/torch).
ARG BASE_IMAGE=python:3.11-slim
# PIP_OPTIONS: e.g. "--no-index --find-links /wheels/base" to build offline from docker/wheels (docker/e2e.sh)
ARG PIP_OPTIONS=""
ARG TORCH_SPEC="torch>=2.1"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
FROM ${BASE_IMAGE}
ARG PIP_OPTIONS
ARG TORCH_SPEC
ARG TORCH_INDEX
WORKDIR /app
COPY pyproject.toml README.md ./
COPY common common
COPY producer producer
COPY consumer consumer
COPY ferry ferry
COPY docker/wheels /wheels
RUN if [ -f "${TORCH_SPEC}" ]; then python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} "${TORCH_SPEC}"; \
    else python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} "${TORCH_SPEC}" --index-url "${TORCH_INDEX}" \
      || python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} "${TORCH_SPEC}"; fi
RUN python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} .
ENV PYTHONUNBUFFERED=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "-m", "ferry"]
