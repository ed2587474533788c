"""Settings of the upload service."""

HOST = "0.0.0.0"
PORT = 8080
MAX_RETRIES = 7
TIMEOUT_SECONDS = 30
