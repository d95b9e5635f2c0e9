# The archiver image: tieredstore with the S3 and PostgreSQL extras on a slim Python.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tieredstore ./tieredstore
COPY providers ./providers
COPY metadata ./metadata
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[s3,postgres]'
VOLUME ["/data"]
ENV TIEREDSTORE_DATA_DIR=/data
ENV TIEREDSTORE_ARCHIVER__METRICS_ADDR=0.0.0.0
EXPOSE 9100
ENTRYPOINT ["tieredstore"]
CMD ["run", "--metrics-port", "9100"]
