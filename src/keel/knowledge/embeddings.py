"""Vectors for chunks and queries from a local OpenAI-compatible `/embeddings` endpoint, and
the fusion of lexical and vector rankings.

The endpoint is the `knowledge.embeddings` setting (`url`, `model`, optional `api_key_env`):
`POST <url>/embeddings {"model", "input": [texts]}` answered with `{"data": [{"index",
"embedding"}]}`. Vectors are L2-normalised, so cosine similarity is a dot product, and stored as
float32. Any failure of the endpoint (down, an HTTP error, a body of the wrong shape) is an
`EmbeddingsError` whose message is one line naming the URL: callers fall back to lexical
ranking and say so; nothing here decides that. Only httpx is imported, and only when a request
is made.
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Texts per request.
BATCH = 64
#: Seconds to wait for the endpoint (a local server; a slow one is treated as down).
TIMEOUT = 20.0
#: Reciprocal rank fusion's constant (the usual 60: ranks far down still count a little).
RRF_K = 60


class EmbeddingsError(Exception):
    """The endpoint could not give vectors; the message is one line for a notice."""


@dataclass(frozen=True)
class EmbeddingsConfig:
    url: str
    model: str
    #: The environment variable holding a bearer token for the endpoint ("" = none).
    api_key_env: str = ""


class Embedder:
    """Asks the endpoint for vectors, `BATCH` texts at a time."""

    def __init__(
        self,
        config: EmbeddingsConfig,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT,
    ) -> None:
        self.config = config
        self.endpoint = config.url.rstrip("/") + "/embeddings"
        self.timeout = timeout
        env = os.environ if env is None else env
        self._key = env.get(config.api_key_env, "") if config.api_key_env else ""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        import httpx

        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        vectors: list[list[float]] = []
        try:
            with httpx.Client(timeout=self.timeout, trust_env=False) as client:
                for start in range(0, len(texts), BATCH):
                    batch = list(texts[start : start + BATCH])
                    response = client.post(
                        self.endpoint,
                        json={"model": self.config.model, "input": batch},
                        headers=headers,
                    )
                    if response.status_code != 200:
                        raise EmbeddingsError(
                            f"{self.endpoint} answered HTTP {response.status_code}"
                        )
                    vectors += _parse(response.json(), len(batch), self.endpoint)
        except httpx.HTTPError as exc:
            raise EmbeddingsError(f"{self.endpoint} unreachable ({type(exc).__name__})") from exc
        except ValueError as exc:  # not JSON
            raise EmbeddingsError(f"{self.endpoint} answered something that is not JSON") from exc
        return vectors


def _parse(body: object, count: int, endpoint: str) -> list[list[float]]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != count:
        raise EmbeddingsError(f"{endpoint} answered without {count} embeddings in `data`")
    slots: list[list[float] | None] = [None] * count
    for position, item in enumerate(data):
        index = item.get("index", position) if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if (
            not isinstance(index, int)
            or not 0 <= index < count
            or not isinstance(vector, list)
            or not vector
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector)
        ):
            raise EmbeddingsError(f"{endpoint} answered an embedding of the wrong shape")
        slots[index] = normalised([float(x) for x in vector])
    if any(s is None for s in slots) or len({len(s) for s in slots if s}) != 1:
        raise EmbeddingsError(f"{endpoint} answered embeddings of different sizes or indexes")
    return [s for s in slots if s is not None]


def normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def pack(vector: Sequence[float]) -> bytes:
    return array("f", vector).tobytes()


def unpack(blob: bytes) -> array[float]:
    out = array("f")
    out.frombytes(blob)
    return out


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The dot product of two normalised vectors."""
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def fuse(*rankings: Sequence[int]) -> list[int]:
    """Reciprocal rank fusion: each id scores the sum of 1/(RRF_K + rank) over the rankings it
    appears in; best first, ties broken by the first ranking's order, then by id."""
    scores: dict[int, float] = {}
    first_seen: dict[int, tuple[int, int]] = {}
    for which, ranking in enumerate(rankings):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (RRF_K + rank)
            first_seen.setdefault(item, (which, rank))
    return sorted(scores, key=lambda i: (-scores[i], first_seen[i], i))
