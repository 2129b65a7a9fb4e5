# The trainer image: the demo training loop on the CPU, with torch.
# TORCH_SPEC may name a wheel in docker/wheels/torch (copied to /wheels/torch in the builder).
#
# Two stages, as in producer.Dockerfile: the builder installs torch, the other dependencies and the wheel
# built from the source under their own roots; the runtime image copies in only the installed trees (no
# source, no wheels) and works in an empty folder, so the one `ferry` on sys.path is the installed one.
ARG BASE_IMAGE=python:3.11-slim
# PIP_OPTIONS: e.g. "--no-index --find-links /wheels/base" to build offline from docker/wheels (docker/e2e.sh)
ARG PIP_OPTIONS=""
ARG TORCH_SPEC="torch>=2.1"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

FROM ${BASE_IMAGE} AS builder
ARG PIP_OPTIONS
ARG TORCH_SPEC
ARG TORCH_INDEX
COPY docker/wheels /wheels
RUN if [ -f "${TORCH_SPEC}" ]; then python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} --root /torch "${TORCH_SPEC}"; \
    else python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} --root /torch "${TORCH_SPEC}" --index-url "${TORCH_INDEX}" \
      || python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} --root /torch "${TORCH_SPEC}"; fi
# prometheus-client: the trainer publishes its metrics (ferry demo --metrics-port, RemoteLoader(metrics_port=))
RUN python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} --root /deps pyzmq msgpack numpy \
    prometheus-client
COPY pyproject.toml README.md /src/
COPY common /src/common
COPY producer /src/producer
COPY consumer /src/consumer
COPY ferry /src/ferry
RUN python3 -m pip wheel --no-cache-dir ${PIP_OPTIONS} --no-deps --wheel-dir /dist /src \
 && python3 -m pip install --no-cache-dir --break-system-packages --no-index --no-deps --root /ferry /dist/ferry-*.whl

FROM ${BASE_IMAGE}
COPY --from=builder /torch/ /
COPY --from=builder /deps/ /
COPY --from=builder /ferry/ /
WORKDIR /work
ENV PYTHONUNBUFFERED=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "-m", "ferry"]
