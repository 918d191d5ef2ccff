"""The stored fingerprints (training run folders, evaluation result variants) keep their
digests: a change of encoding would orphan every stored run and result."""

from __future__ import annotations

from dataclasses import dataclass

from conductor_pipeline.evaluation.systems import fingerprint
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.tasks import Task
from conductor_pipeline.training.inputs import PoolInfo, data_version


@dataclass
class _Settings:
    rounds: int = 2
    name: str = "x"


def test_training_fingerprints_keep_their_digests():
    assert content_hash({"names": ["a", "b"], "prices": [[1.0, 2.0], None]}) == "caa57efa923e"
    assert content_hash([("t1", "Q é?", "4", "numeric")]) == "a2990101fa7d"
    assert content_hash("prompt", length=8) == "d5c35dc4"


def test_result_variants_keep_their_digests():
    assert fingerprint("solo", "pool123", "worker-a") == "3fa8973a3878"
    assert fingerprint("pool", _Settings(), {"k": 2}) == "9896150d0dbe"


def test_the_training_fingerprints_go_through_content_hash():
    task = Task("t1", "math", "easy", "Q é?", "4", "number", "numeric", "test")
    assert data_version([task]) == "a2990101fa7d"
    pool = PoolInfo(None, ["a", "b"], ["", ""], [(1.0, 2.0), None])
    assert pool.fingerprint() == "caa57efa923e"


def test_a_dataclass_hashes_as_its_fields():
    assert content_hash(_Settings()) == content_hash({"rounds": 2, "name": "x"})
