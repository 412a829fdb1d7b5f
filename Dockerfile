# syntax=docker/dockerfile:1
# kthena-router image: build the wheel with maturin, install it into a venv, copy the venv into
# a slim runtime that runs as a non-root user. Every RUN calls scripts/image-build.sh (tested
# without a container engine by tests/deploy/test_image_build.py). CI does not build this image.
#   docker build -t kthena-router:0.1.0 .
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV CARGO_HOME=/opt/cargo RUSTUP_HOME=/opt/rustup PATH=/opt/cargo/bin:${PATH} \
    CARGO_TARGET_DIR=/src/target PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY scripts/image-build.sh scripts/image-build.sh
RUN scripts/image-build.sh toolchain
COPY Cargo.toml Cargo.lock pyproject.toml ./
COPY rust rust
COPY kthena_router kthena_router
COPY controller controller
RUN --mount=type=cache,target=/src/target --mount=type=cache,target=/opt/cargo/registry \
    DIST=/src/dist scripts/image-build.sh wheel
RUN DIST=/src/dist PREFIX=/opt/kthena-router scripts/image-build.sh install

FROM ${PYTHON_IMAGE} AS runtime
# same base image as the build stage: the venv's python symlink points at the same interpreter
COPY --from=build /opt/kthena-router /opt/kthena-router
COPY --from=build /src/scripts/image-build.sh /usr/local/libexec/kthena/image-build.sh
RUN PREFIX=/opt/kthena-router /usr/local/libexec/kthena/image-build.sh verify
ENV PATH=/opt/kthena-router/bin:${PATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
# numeric, so runAsNonRoot can verify it; no account is needed (the pod sets the same ids)
USER 65532:65532
EXPOSE 8080 15000
ENTRYPOINT ["kthena-router"]
CMD ["--help"]
