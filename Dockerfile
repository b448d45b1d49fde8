# Image for the manager, the observer service and the migrations (see compose.yaml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The whole repository (minus .dockerignore). Installed editable: the manager reads
# alembic.ini and migrations/ from here to check the schema at start-up. The `server` extra
# holds the manager's and the services' dependencies (the base install is the CLI only).
COPY . .
RUN pip install -e '.[server]' \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin orch

USER orch

EXPOSE 8000
CMD ["python", "-m", "manager"]
