"""The stored digests (training run folders, evaluation result variants, task ids made from
a question, adapter identities) stay as they were: a change of encoding would orphan every
stored run and result, and give logged tasks new ids."""

from __future__ import annotations

from dataclasses import dataclass

from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.systems import fingerprint
from conductor_pipeline.hashing import content_hash, files_hash
from conductor_pipeline.tasks import Task
from conductor_pipeline.training.artifacts import adapter_hash
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


def test_bytes_hash_as_they_are():
    # a logged task's id: the digest of its question
    assert content_hash(b"What is 2+2?") == "52cb6b5e4a03"
    assert QuestionResult.hash_task("Q?", "4") == "bf5853ebde9e308c"


def _adapter_folder(root):
    (root / "warm_start").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "adapter_config.json").write_bytes(b"{}")
    (root / "adapter_model.safetensors").write_bytes(b"w")
    (root / "warm_start" / "adapter_model.safetensors").write_bytes(b"x")
    (root / "sub" / "README.md").write_bytes(b"r")
    return root


def test_folder_digests_keep_their_values(tmp_path):
    folder = _adapter_folder(tmp_path / "adapter")
    assert adapter_hash(folder) == "85bde73694fa"
    files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    assert files_hash(files) == "f8ee891e1dd3"  # a served adapter's evaluation variant
