# The producer image: pyzmq, msgpack and numpy; no torch (a dataset that needs torch adds it).
ARG BASE_IMAGE=python:3.11-slim
# PIP_OPTIONS: e.g. "--no-index --find-links /wheels/base" to build offline from docker/wheels (docker/e2e.sh)
ARG PIP_OPTIONS=""
FROM ${BASE_IMAGE}
ARG PIP_OPTIONS
WORKDIR /app
COPY pyproject.toml README.md ./
COPY common common
COPY producer producer
COPY consumer consumer
COPY ferry ferry
COPY docker/wheels/base /wheels/base
RUN python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} pyzmq msgpack numpy \
 && python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} --no-deps .
ENV PYTHONUNBUFFERED=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "-m", "ferry.producer"]
