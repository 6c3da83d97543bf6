# One image for every Kube-Pathways process: the operator, the two containers of each
# worker pod (the JAX `worker` and the `dataflow` sidecar), and program driver pods
# (`python -m pathways.driver`) unless a program names an image of its own.
#
#   docker build -t kube-pathways:0.1.0 .
#   docker run --rm kube-pathways:0.1.0 operator --help   # python -m pathways_operator
#   ... worker ...                                          # python -m pathways_worker.worker
#   ... sidecar ...                                         # python -m pathways_worker.sidecar
#
# Kubernetes sets `command:` itself (the chart: [python, -m, pathways_operator]), which
# replaces the entrypoint below; the entrypoint is for `docker run`.

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 10001 pathways \
 && useradd --uid 10001 --gid 10001 --home-dir /home/pathways --create-home \
        --shell /usr/sbin/nologin pathways
COPY pyproject.toml README.md /src/
COPY client /src/client
COPY operator /src/operator
COPY worker /src/worker
RUN pip install /src && rm -rf /src
# Example programs, importable as `examples.<module>` by program drivers run from this
# image (a driver pod's default image; users build theirs FROM it: examples/driver/Dockerfile).
COPY examples /opt/kube-pathways/examples
ENV PYTHONPATH=/opt/kube-pathways
RUN printf '%s\n' \
      '#!/bin/sh' \
      '# operator, worker or sidecar, then its arguments; any other command runs as is.' \
      'case "$1" in' \
      '  operator) shift; exec python -m pathways_operator "$@" ;;' \
      '  worker) shift; exec python -m pathways_worker.worker "$@" ;;' \
      '  sidecar|dataflow) shift; exec python -m pathways_worker.sidecar "$@" ;;' \
      '  *) exec "$@" ;;' \
      'esac' > /usr/local/bin/pathways-entrypoint \
 && chmod 0755 /usr/local/bin/pathways-entrypoint
USER 10001:10001
WORKDIR /home/pathways
# controller gRPC, metrics, kopf liveness
EXPOSE 8470 9090 8080
ENTRYPOINT ["pathways-entrypoint"]
CMD ["operator", "--all-namespaces", "--controller-listen=0.0.0.0:8470", "--liveness=http://0.0.0.0:8080/healthz"]
