# syntax=docker/dockerfile:1
# One image for the worker, Flower and the demo upstream (see docker-compose.yml).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker ./worker
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOOLWORKER_DEFINITIONS=/app/definitions
# The dependencies at the locked versions, each file checked against its hash (`make lock` writes the lock),
# then the package itself without dependencies of its own choosing.
COPY requirements.lock /tmp/requirements.lock
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock \
    && pip install --no-cache-dir --no-deps /wheels/*.whl \
    && rm /tmp/requirements.lock \
    && useradd --system --uid 10001 --no-create-home toolworker
WORKDIR /app
# The example definitions; docker-compose.yml mounts ./definitions over them, read-only.
COPY definitions ./definitions
USER toolworker
ENTRYPOINT ["toolworker"]
CMD ["worker"]
