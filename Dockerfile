# The operator and the node agent share one image: `vgpu-operator run` / `vgpu-operator agent`.

# HAMi-core (libvgpu.so), which enforces each container's memory and compute share, built
# from source. HAMi-core publishes no release tags: this is the revision HAMi v2.9.0 ships
# (its libvgpu submodule), fetched as a source archive and checked against its digest.
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu22.04
FROM ${CUDA_DEVEL_IMAGE} AS hami-core
ARG HAMI_CORE_COMMIT=5091a2fbe1816df1265490f771346730f29e2c8d
ARG HAMI_CORE_SHA256=""
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The build tools come from the CUDA image's distribution release; their versions do not
# reach the image that ships (only libvgpu.so does).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake make ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN curl -fsSL -o hami-core.tar.gz \
        "https://github.com/Project-HAMi/HAMi-core/archive/${HAMI_CORE_COMMIT}.tar.gz" \
    && if [ -n "${HAMI_CORE_SHA256}" ]; then \
        echo "${HAMI_CORE_SHA256}  hami-core.tar.gz" | sha256sum -c -; fi \
    && tar -xzf hami-core.tar.gz --strip-components=1 \
    && rm hami-core.tar.gz
# HAMi's own build script and options (CUDA headers from the devel image). The archive has
# no .git, so the script records the commit through CI_COMMIT_SHA.
RUN CI_COMMIT_SHA="${HAMI_CORE_COMMIT}" bash ./build.sh \
    && cp build/libvgpu.so /libvgpu.so

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# The source directory is called operator/, which would shadow the standard library's
# `operator` module for a Python started next to it; installing the wheel avoids that,
# and PYTHONSAFEPATH makes sure of it.
ENV PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The agent copies it onto the host at start (--hami-core-library), as HAMi's vgpu-init does.
COPY --from=hami-core /libvgpu.so /opt/vgpu-operator/hami-core/libvgpu.so
USER 65532:65532
ENTRYPOINT ["vgpu-operator"]
CMD ["run"]
