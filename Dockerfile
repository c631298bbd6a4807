# syntax=docker/dockerfile:1
# The shuniu gateway image: docs/kubernetes.md.
#
#   docker build -t shuniu:0.1.0 .                                  # the gateway alone
#   docker build -t shuniu:0.1.0 --build-arg EXTRAS=dns,redis,otel . # with Redis and tracing
#
# It runs `shuniu serve /etc/shuniu/deployment.yaml` as an unprivileged user; mount the
# deployment file there (a ConfigMap) and pass keys as environment variables from a Secret
# (`${VAR}` in the file). SIGTERM drains: in-flight requests finish within
# gateway.graceful_shutdown_s, which must be shorter than the pod's grace period.

ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
# The slim image has no C compiler, so the modules setup.py compiles stay pure Python (the
# same results): set SHUNIU_COMPILE=1, on an image with gcc, for the simulator's engine
# (an image that plans capacity) and a request's tenancy and rate limits compiled.
ARG SHUNIU_COMPILE=0
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY core core
COPY plugins plugins
COPY backends backends
COPY hardware hardware
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
# Comma-separated extras of the shuniu package (dns, redis, otel, tokenizers, jwt, plot, ...);
# the default brings DNS discovery (docs/discovery.md).
ARG EXTRAS="dns"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
RUN set -eu; \
    wheel="$(ls /wheels/shuniu-*.whl)"; \
    if [ -n "$EXTRAS" ]; then target="${wheel}[${EXTRAS}]"; else target="$wheel"; fi; \
    pip install --no-cache-dir --find-links /wheels "$target"; \
    rm -rf /wheels; \
    groupadd --system --gid 10001 shuniu; \
    useradd --system --uid 10001 --gid shuniu --home-dir /nonexistent --shell /usr/sbin/nologin shuniu; \
    mkdir -p /etc/shuniu
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["shuniu"]
CMD ["serve", "/etc/shuniu/deployment.yaml"]
