# The producer image: pyzmq, msgpack and numpy; no torch (a dataset that needs torch adds it).
#
# Two stages. The builder turns the source into a wheel and installs it, and the dependencies, each under its
# own root (pip install --root). The runtime image copies in only those installed trees: no source, no wheels,
# and a working directory with nothing in it, so the one `ferry` on sys.path is the installed one in
# site-packages (dist-packages with Debian's python3). `python -m` puts the working directory first on
# sys.path: a source tree there would shadow the package (the top-level folders install as ferry.common,
# ferry.producer and ferry.consumer, so the source's ferry/ has no common/ in it).
ARG BASE_IMAGE=python:3.11-slim
# PIP_OPTIONS: e.g. "--no-index --find-links /wheels/base" to build offline from docker/wheels (docker/e2e.sh)
ARG PIP_OPTIONS=""

FROM ${BASE_IMAGE} AS builder
ARG PIP_OPTIONS
COPY docker/wheels/base /wheels/base
RUN python3 -m pip install --no-cache-dir --break-system-packages ${PIP_OPTIONS} --root /deps pyzmq msgpack numpy
COPY pyproject.toml README.md /src/
COPY common /src/common
COPY producer /src/producer
COPY consumer /src/consumer
COPY ferry /src/ferry
RUN python3 -m pip wheel --no-cache-dir ${PIP_OPTIONS} --no-deps --wheel-dir /dist /src \
 && python3 -m pip install --no-cache-dir --break-system-packages --no-index --no-deps --root /ferry /dist/ferry-*.whl

FROM ${BASE_IMAGE}
COPY --from=builder /deps/ /
COPY --from=builder /ferry/ /
WORKDIR /work
ENV PYTHONUNBUFFERED=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "-m", "ferry.producer"]
