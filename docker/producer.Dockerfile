# The producer image: pyzmq, msgpack and numpy; no torch (a dataset that needs torch adds it).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
WORKDIR /app
COPY pyproject.toml README.md ./
COPY common common
COPY producer producer
COPY consumer consumer
COPY ferry ferry
RUN python -m pip install --no-cache-dir pyzmq msgpack numpy \
 && python -m pip install --no-cache-dir --no-deps .
ENV PYTHONUNBUFFERED=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "producer"]
