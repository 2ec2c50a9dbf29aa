# The lab in a container: one replica. Its steps are the README's (`make install`, `make run`);
# several containers behind nginx (deploy/nginx.conf.in, sticky sessions) serve a class.
#
#   docker build -t paged-lab .
#   docker run -p 8501:8501 paged-lab          # then http://localhost:8501
FROM python:3.11-slim-bookworm

# make runs the README's targets; nothing else from Debian: every wheel is a binary one.
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*

# torch is pinned to 2.13.0. From PyPI that is the CUDA build for Linux, with several GB of
# CUDA libraries a CPU container never loads (the lab runs Triton's interpreter there); the
# PyTorch CPU index has the same release as 2.13.0+cpu, which pip takes for the pin. (The
# machine the lab is developed on has that CPU wheel locally, which is why its plain
# `make install` gets it.) For a GPU host, build without this line: the CUDA wheel is the one.
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home lab
USER lab
WORKDIR /home/lab/paged-lab
# The requirements first, so the dependency layer is rebuilt only when they change.
COPY --chown=lab Makefile requirements.txt requirements-nodeps.txt ./
RUN make install
COPY --chown=lab . .

# The settings of a shared deployment (the same as deploy/lab.sh's replicas): no server-side
# /metrics fetch (the page would reach hosts on the container's network), no developer menu
# (rerun, clear cache), error types but no tracebacks in the browser, no file watcher, one
# BLAS thread (the Makefile's default). `make run` adds the port and headless mode.
ENV PAGED_LAB_URL_FETCH=off \
    OPENBLAS_NUM_THREADS=1 \
    STREAMLIT_CLIENT_TOOLBAR_MODE=viewer \
    STREAMLIT_CLIENT_SHOW_ERROR_DETAILS=type \
    STREAMLIT_SERVER_FILE_WATCHER_TYPE=none

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"
CMD ["make", "run"]
