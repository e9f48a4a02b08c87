# The operator and the node agent share one image: `vgpu-operator run` / `vgpu-operator agent`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# The source directory is called operator/, which would shadow the standard library's
# `operator` module for a Python started next to it; installing the wheel avoids that,
# and PYTHONSAFEPATH makes sure of it.
ENV PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["vgpu-operator"]
CMD ["run"]
