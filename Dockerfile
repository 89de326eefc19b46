# Targets:
#   sandbox  the worker runtime only (standard library, non-root); one container per sandbox worker
#   service  the API (FastAPI + uvicorn); drives sandbox containers through the Docker socket
#   redis    a Redis server built from the same base, for machines that cannot pull images
# BASE_IMAGE lets an offline machine build on a local image (see scripts/docker-images).
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS sandbox
ARG RUNTIME_DIGEST=unknown
LABEL envfoundry.runtime=${RUNTIME_DIGEST}
# The worker side, its wire and the state codec (sandbox.backends.container.RUNTIME_FOLDERS): standard library only.
COPY sandbox/__init__.py /opt/envfoundry/sandbox/
COPY sandbox/worker /opt/envfoundry/sandbox/worker
COPY sandbox/wire /opt/envfoundry/sandbox/wire
COPY sandbox/state /opt/envfoundry/sandbox/state
RUN python3 -m compileall -q /opt/envfoundry/sandbox
USER 65534:65534
WORKDIR /tmp
# (no -E: the service sets the container's whole environment, PYTHONHASHSEED included)
ENTRYPOINT ["python3", "-S", "-s", "-B", "/opt/envfoundry/sandbox/worker/main.py", "--container"]

FROM ${BASE_IMAGE} AS service
# Offline builds put the project's wheel and its dependencies in wheelhouse (scripts/docker-images
# does); with the folder empty the build installs from the package index instead.
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/venv
WORKDIR /opt/envfoundry
COPY wheelhouse/ /wheels/
COPY pyproject.toml README.md ./
COPY service ./service
COPY sandbox ./sandbox
COPY synthesis ./synthesis
COPY catalog ./catalog
RUN if ls /wheels/*.whl >/dev/null 2>&1; then pip install --no-cache-dir --quiet --no-index --find-links /wheels envfoundry; \
    else pip install --no-cache-dir --quiet .; fi && rm -rf /wheels
EXPOSE 8000
ENTRYPOINT ["envfoundry", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM ${BASE_IMAGE} AS redis
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
USER redis
EXPOSE 6379
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]

FROM ${BASE_IMAGE} AS proxy
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/compose/haproxy.cfg /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8000
CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
