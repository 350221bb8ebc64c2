# The Magnetar worker image: `docker build -t magnetar .` (docker-compose.yml builds it too).
# It runs `magnetar worker start`; configure it with MAGNETAR_* variables (see
# magnetar/worker/config.py): at least MAGNETAR_BROKER_URL, MAGNETAR_WORKER_ID and
# MAGNETAR_ADVERTISED_URL, and MAGNETAR_PULSAR_ADMIN_URL on an Apache Pulsar cluster.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: Magnetar and its dependencies in a virtual environment (wheels only, no compiler)
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/magnetar
WORKDIR /src
COPY pyproject.toml README.md ./
COPY magnetar ./magnetar
RUN /opt/magnetar/bin/pip install --no-cache-dir .

# --- runtime: the environment alone, run by an unprivileged user
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/magnetar/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MAGNETAR_HTTP_HOST=0.0.0.0 \
    MAGNETAR_HTTP_PORT=8080 \
    MAGNETAR_DATA_DIR=/var/lib/magnetar/data
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/magnetar magnetar \
    && mkdir /var/lib/magnetar/data \
    && chown magnetar:magnetar /var/lib/magnetar/data
COPY --from=build /opt/magnetar /opt/magnetar
USER 10001:10001
WORKDIR /var/lib/magnetar
VOLUME ["/var/lib/magnetar/data"]
EXPOSE 8080
# Healthy once the worker has caught up with the cluster and knows its leader (503 before).
# Python, not curl: the slim image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('MAGNETAR_HTTP_PORT', '8080') + '/admin/v2/worker/cluster/leader/ready', timeout=4)"]
# Exec form: the worker is PID 1 and gets SIGTERM itself, so `docker stop` drains instances.
ENTRYPOINT ["magnetar"]
CMD ["worker", "start"]
