# syntax=docker/dockerfile:1
# A vLLM serving image with dspark_hotfix: FROM the image you serve today.
#   docker build --build-arg VLLM_IMAGE=<your pinned vLLM image> -t vllm-dspark-hotfix .
#   docker run ... -e DSPARK_HOTFIX=0 ...   # the B arm of an A/B: vLLM as shipped
ARG VLLM_IMAGE=vllm/vllm-openai:v0.25.0

FROM python:3.12-slim AS wheel
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY dspark_hotfix ./dspark_hotfix
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${VLLM_IMAGE}
# The interpreter vLLM runs under in the base image, and where the shim's
# start-up directory is linked (it holds only sitecustomize.py).
ARG PYTHON=python3
ARG DSPARK_HOTFIX_DIR=/opt/dspark_hotfix
ARG WHEELS=/tmp/dspark-hotfix
# wrapt, the shim's only dependency: an image that has one keeps it (doctor checks
# it is 1.17 to 2.x); one that has none gets this. 1.17.3 loads in half the memory
# of 2.5 (docs/BENCHMARKS.md) and suits packages that still pin wrapt<2.
ARG WRAPT=wrapt==1.17.3
COPY --from=wheel /dist/ ${WHEELS}/
# --no-deps: vLLM's environment stays exactly as it is.
RUN ${PYTHON} -m pip install --no-cache-dir --no-deps ${WHEELS}/dspark_hotfix-*.whl \
 && { ${PYTHON} -c "import wrapt" 2>/dev/null || ${PYTHON} -m pip install --no-cache-dir --no-deps "${WRAPT}"; } \
 && ln -s "$(${PYTHON} -m dspark_hotfix path)" "${DSPARK_HOTFIX_DIR}" \
 && rm -rf "${WHEELS}"
ENV PYTHONPATH=${DSPARK_HOTFIX_DIR}${PYTHONPATH:+:${PYTHONPATH}} \
    DSPARK_HOTFIX=1
# A broken image fails to build here instead of at rollout.
RUN ${PYTHON} -m dspark_hotfix doctor
