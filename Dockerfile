# syntax=docker/dockerfile:1
# A vLLM serving image with dspark_hotfix: FROM the image you serve today.
#   docker build --build-arg VLLM_IMAGE=<your pinned vLLM image> -t vllm-dspark-hotfix .
#   docker run ... -e DSPARK_HOTFIX=0 ...   # the B arm of an A/B: vLLM as shipped
# Both base images are arguments, so a mirror or a local image will do; so is the
# package index (PIP_INDEX_URL, read by pip), which only the wheel's build
# requirements and, where the image has none, wrapt come from. The default vLLM
# image carries the upstream fix, and still needs the hybrid-off stop (kv_cache_groups).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.25.0
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS wheel
ARG PIP_INDEX_URL=""
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY dspark_hotfix ./dspark_hotfix
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${VLLM_IMAGE}
# The interpreter vLLM runs under in the base image, and where the shim's
# start-up directory is linked (it holds only sitecustomize.py).
ARG PYTHON=python3
ARG DSPARK_HOTFIX_DIR=/opt/dspark_hotfix
# wrapt, the shim's only dependency: an image that has one keeps it (doctor checks
# it is 1.17 to 2.x); one that has none gets this. 1.17.3 loads in half the memory
# of 2.5 (docs/BENCHMARKS.md) and suits packages that still pin wrapt<2.
ARG WRAPT=wrapt==1.17.3
ARG PIP_INDEX_URL=""
# The wheel's version; the install step below refuses a wheel of another one, so
# the labels cannot lie.
ARG DSPARK_HOTFIX_VERSION=0.8.0
# doctor exits 3 where vLLM needs no fix (the shim would be a no-op there): such a
# build fails unless ALLOW_NOT_NEEDED=1 says that is intended.
ARG ALLOW_NOT_NEEDED=0
LABEL org.opencontainers.image.version="${DSPARK_HOTFIX_VERSION}" \
      io.dspark-hotfix.version="${DSPARK_HOTFIX_VERSION}"
# The wheel is mounted, not copied: no layer keeps it. --no-deps: vLLM's
# environment stays exactly as it is.
RUN --mount=type=bind,from=wheel,source=/dist,target=/tmp/dspark-hotfix \
    ${PYTHON} -m pip install --no-cache-dir --no-deps "/tmp/dspark-hotfix/dspark_hotfix-${DSPARK_HOTFIX_VERSION}-py3-none-any.whl" \
 && { ${PYTHON} -c "import wrapt" 2>/dev/null || ${PYTHON} -m pip install --no-cache-dir --no-deps "${WRAPT}"; } \
 && ln -s "$(${PYTHON} -m dspark_hotfix path)" "${DSPARK_HOTFIX_DIR}"
ENV PYTHONPATH=${DSPARK_HOTFIX_DIR}${PYTHONPATH:+:${PYTHONPATH}} \
    DSPARK_HOTFIX=1
# An image in which the fix would not be active fails to build here instead of at rollout.
# Doctor imports vLLM; with no bytecode written, this step adds nothing to the image (an empty
# layer where each instruction makes one, as docker build does; 43,520 B of bytecode otherwise).
RUN PYTHONDONTWRITEBYTECODE=1 ${PYTHON} -m dspark_hotfix doctor || { \
      rc=$?; \
      if [ "${rc}" -eq 3 ] && [ "${ALLOW_NOT_NEEDED}" = 1 ]; then \
        echo "dspark_hotfix: this vLLM needs no fix (the shim is a no-op here); built because ALLOW_NOT_NEEDED=1"; \
      else \
        [ "${rc}" -ne 3 ] || echo "dspark_hotfix: this vLLM needs no fix; build with --build-arg ALLOW_NOT_NEEDED=1 to build anyway" >&2; \
        exit "${rc}"; \
      fi; \
    }
