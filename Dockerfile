# The archive and its load-test toolkit (locust, wrk) in one image.
#   docker build -t dicomweb-archive .
# The archive listens on 0.0.0.0 in the container, so it refuses to start without
# authentication. Either give API keys in the environment (clients then send
# "Authorization: Bearer my-secret-token"):
#   docker run -p 127.0.0.1:8080:8080 -v archive-data:/data \
#     -e DICOMWEB_API_KEYS='{"my-secret-token": ["read", "write", "delete"]}' dicomweb-archive
# or, published on the host's loopback only, run it without authentication:
#   docker run -p 127.0.0.1:8080:8080 -v archive-data:/data -e DICOMWEB_INSECURE=true dicomweb-archive
# docker-compose.yml does the latter inside its private network.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends wrk \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY dicomweb_server ./dicomweb_server
COPY dicomweb_client ./dicomweb_client
COPY loadtests ./loadtests
RUN pip install --no-cache-dir '.[load,postgresql,s3]'

# glibc: keep large buffers instead of handing them back to the OS after each request
# (dicomweb-server sets these itself too; stated here for other entry points)
ENV MALLOC_MMAP_THRESHOLD_=67108864 \
    MALLOC_TRIM_THRESHOLD_=268435456 \
    DICOMWEB_DATA_DIR=/data \
    DICOMWEB_HOST=0.0.0.0 \
    DICOMWEB_PORT=8080
VOLUME ["/data"]
EXPOSE 8080 8089
CMD ["dicomweb-server", "serve"]
