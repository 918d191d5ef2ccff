"""The Conductor systems' policies of an evaluation: the Conductor under test, the untrained
base policy, the champion and the warm start, built in this process or served by a policy
server that the evaluation launches.

An ``endpoint`` Conductor (``conf/gpu``) does not load adapters itself: the server decides
what it answers with. So with ``evaluation.policy_server: vllm`` the evaluation launches the
policy server (``serving.vllm``) for its duration with every adapter it evaluates as a
named LoRA module (the candidate as ``conductor-v<N>``, the champion as ``conductor-v<M>``,
a warm start next to them) and asks for each model by its served name; the untrained base
is asked for by the name the server gives the base model. Without it, the endpoint is
evaluated as whatever it serves and labelled as that endpoint, never as a registry version
(so promotion has nothing to decide on).
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.evaluation.config import EvaluationConfig
from conductor_pipeline.evaluation.runner import PolicyUnderTest
from conductor_pipeline.evaluation.systems import fingerprint
from conductor_pipeline.hashing import files_hash
from conductor_pipeline.paths import project_root
from conductor_pipeline.promotion import CHAMPION
from conductor_pipeline.registry import registered_model

logger = logging.getLogger(__name__)

# where training puts the run's SFT-only adapter inside the trained one
# (``training.artifacts.WARM_START_DIR``, repeated here: importing ``training`` costs seconds)
WARM_START_DIR = "warm_start"


def _folder_digest(folder: str, *, skip: str | None = None) -> str:
    """What a folder's model answers depend on: its files' names and bytes. ``skip``: a
    sub-folder left out (the warm-start adapter inside a trained one, which the trained
    Conductor never loads, so a new warm start does not re-run the Conductor's questions)."""
    return files_hash(
        path
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file() and (skip is None or path.relative_to(folder).parts[0] != skip)
    )


def build_policies(
    conductor_params: dict[str, Any], config: EvaluationConfig, candidate: str | None = None
) -> tuple[PolicyUnderTest, PolicyUnderTest | None]:
    """The Conductor under test and the untrained base policy.

    The Conductor is ``evaluation.conductor.adapter`` when set (it must then resolve), else
    ``candidate`` (the version training just registered, in the default pipeline; it must
    resolve too), else ``conductor.policy.adapter`` (default ``models:/conductor@champion``,
    which may not exist yet). While nothing is registered, the base policy is evaluated
    under the name ``conductor`` and its label says so; it is then the same model object as
    ``base-policy``, so it is sampled once. ``conductor.policy.kind: scripted`` evaluates the
    fixed rule under the name ``conductor``, labelled as such.
    """
    from conductor_pipeline.serving.models import resolve_served_model
    from conductor_pipeline.workflow.config import build_policy

    policy_params = dict(conductor_params.get("policy") or {})
    explicit = config.conductor.adapter is not None or candidate is not None
    reference = config.conductor.adapter or candidate or policy_params.get("adapter")
    served = resolve_served_model(reference, explicit=explicit, root=project_root())
    kind = policy_params.get("kind", "local")
    base_params = {**policy_params, **config.base_policy}
    base_params.pop("adapter", None)
    base_id = "base:" + fingerprint({k: v for k, v in base_params.items() if k != "api_key_env"})
    base_label = f"untrained base policy ({base_params.get('model_dir') or base_params.get('model') or 'SmolLM2-135M-Instruct'})"

    if kind == "scripted":
        worker = policy_params.get("worker", 0)
        rule = PolicyUnderTest(
            build_policy(policy_params),
            f"scripted:{worker}",
            f"SCRIPTED RULE (every question to worker {worker}; not a trained Conductor)",
        )
        wants_base = bool(config.base_policy) and base_params.get("kind") != "scripted"
        base = (
            PolicyUnderTest(build_policy(base_params), base_id, base_label) if wants_base else None
        )
        return rule, base
    if served.adapter_dir is None and kind == "local":
        base = build_policy(base_params, adapter_dir=None)
        note = (
            f"no trained adapter: {reference or 'no adapter configured'} does not resolve, "
            "so the untrained base policy is evaluated as the conductor"
        )
        logger.warning("evaluation: %s", note)
        return (
            PolicyUnderTest(base, base_id, f"BASE POLICY ({note})"),
            PolicyUnderTest(base, base_id, base_label),
        )
    if kind == "endpoint":
        # the server answers with whatever it was started with; naming the rows after the
        # registry version would let promotion compare a model with itself
        variant = f"endpoint:{policy_params.get('model')}"
        label = f"endpoint {policy_params.get('model')} at {policy_params.get('api_base')}"
        if served.adapter_dir:
            logger.warning(
                "evaluation: %s is not loaded by an endpoint Conductor; the rows are labelled "
                "%s (set evaluation.policy_server: vllm to evaluate the version itself)",
                served.reference or served.adapter_dir,
                label,
            )
    elif served.version == "adapter":
        variant = f"adapter:{_folder_digest(served.adapter_dir, skip=WARM_START_DIR)}"
        label = f"adapter folder {served.adapter_dir}"
    else:
        variant = served.id if served.adapter_dir else f"endpoint:{policy_params.get('model')}"
        label = (
            f"{served.reference} (version {served.version})"
            if served.adapter_dir
            else f"endpoint {policy_params.get('model')}"
        )
    conductor = PolicyUnderTest(
        build_policy(policy_params, adapter_dir=served.adapter_dir if kind == "local" else None),
        variant,
        label,
        adapter_dir=served.adapter_dir if kind == "local" else None,
    )
    if kind != "local" and not config.base_policy:
        logger.warning(
            "evaluation: base-policy skipped: an endpoint Conductor needs evaluation.base_policy "
            "(e.g. {model: hosted_vllm/conductor-base}) to reach the untrained model"
        )
        return conductor, None
    return conductor, PolicyUnderTest(
        build_policy(base_params, adapter_dir=None), base_id, base_label
    )


def warm_start_policy(
    conductor: PolicyUnderTest, conductor_params: dict[str, Any], config: EvaluationConfig
) -> PolicyUnderTest | None:
    """The same training run's SFT-only adapter, when the Conductor under test carries one.

    Training copies the warm-start adapter into ``warm_start/`` of the trained adapter folder
    (and so into the registry); evaluating it next to ``conductor`` shows what GRPO added on
    top of the warm start. Its variant is a digest of that folder, so a rerun reuses its
    stored results and a new adapter runs again. Nothing to evaluate (logged, not an error):
    ``warm-start`` not listed, a Conductor that is not a local adapter (the base policy, a
    scripted rule, an endpoint as in ``conf/gpu``), or an adapter trained without a warm
    start (e.g. retrained from a champion).
    """
    from conductor_pipeline.workflow.config import build_policy

    if not config.wants("warm-start"):
        return None
    if conductor.adapter_dir is None:
        logger.info(
            "evaluation: warm-start skipped: the Conductor under test is not a local adapter"
        )
        return None
    folder = Path(conductor.adapter_dir) / WARM_START_DIR
    if not (folder / "adapter_config.json").is_file():
        logger.info(
            "evaluation: warm-start skipped: %s holds no %s/ adapter (trained without a warm start)",
            conductor.adapter_dir,
            WARM_START_DIR,
        )
        return None
    policy_params = dict(conductor_params.get("policy") or {})
    return PolicyUnderTest(
        build_policy(policy_params, adapter_dir=str(folder)),
        f"warm-start:{_folder_digest(str(folder))}",
        f"warm-start (SFT-only) adapter of {conductor.label}",
        adapter_dir=str(folder),
    )


def _champion() -> Any:
    """The registry's champion as a ``ServedModel`` (version ``base`` while there is none)."""
    from conductor_pipeline.serving.models import resolve_served_model

    return resolve_served_model(
        f"models:/{registered_model()}@{CHAMPION}", explicit=False, root=project_root()
    )


def champion_policy(
    conductor: PolicyUnderTest, conductor_params: dict[str, Any], config: EvaluationConfig
) -> PolicyUnderTest | None:
    """The current champion, evaluated next to a different Conductor under test, so that
    promotion gates the candidate against figures measured now, on the same questions, by
    the same means. ``None`` (logged) when ``champion`` is not listed, nothing is champion
    yet, the Conductor under test is the champion, or the policy cannot load its adapter in
    this process (an endpoint without ``evaluation.policy_server: vllm``; a scripted rule).
    """
    from conductor_pipeline.workflow.config import build_policy

    if not config.wants("champion"):
        return None
    policy_params = dict(conductor_params.get("policy") or {})
    kind = policy_params.get("kind", "local")
    if kind != "local":
        logger.info(
            "evaluation: champion skipped: a %s Conductor cannot switch to the champion's "
            "adapter (evaluation.policy_server: vllm serves both)",
            kind,
        )
        return None
    champion = _champion()
    if champion.adapter_dir is None:
        logger.info("evaluation: champion skipped: no %s@%s yet", registered_model(), CHAMPION)
        return None
    if champion.id == conductor.variant:
        logger.info("evaluation: champion skipped: %s is the Conductor under test", champion.id)
        return None
    return PolicyUnderTest(
        build_policy(policy_params, adapter_dir=champion.adapter_dir),
        champion.id,
        f"champion {champion.reference} (version {champion.version})",
        adapter_dir=champion.adapter_dir,
    )


@dataclass
class ConductorsUnderTest:
    """The Conductor systems' policies of one evaluation and, with ``policy_server: vllm``,
    the (not yet started) server that serves all of them: every adapter as a named LoRA
    module on one base model. ``server`` is ``None`` when the policies run in this process."""

    server: Any  # VllmPolicyServer, or None
    conductor: PolicyUnderTest
    base: PolicyUnderTest | None
    champion: PolicyUnderTest | None
    warm_start: PolicyUnderTest | None

    def serving(self) -> AbstractContextManager[Any]:
        """The context the evaluation runs in: the launched server, or nothing to launch."""
        return self.server if self.server is not None else contextlib.nullcontext()

    @property
    def served_names(self) -> dict[str, str]:
        """System → the model name it asks the server for (for the run info and tests);
        empty without a launched server."""
        if self.server is None:
            return {}
        named = {
            "conductor": self.conductor,
            "champion": self.champion,
            "warm-start": self.warm_start,
            "base-policy": self.base,
        }
        return {
            system: put.policy.model.split("/", 1)[1]
            for system, put in named.items()
            if put is not None
        }


def conductors_under_test(
    conductor_params: dict[str, Any],
    config: EvaluationConfig,
    serving_params: dict[str, Any] | None = None,
    candidate: str | None = None,
) -> ConductorsUnderTest:
    """The Conductor systems' policies of an evaluation: served by the policy server the
    evaluation launches (``evaluation.policy_server: vllm``, :func:`served_conductors`),
    else built in this process (:func:`build_policies`, :func:`warm_start_policy`,
    :func:`champion_policy`)."""
    if config.policy_server == "vllm":
        return served_conductors(conductor_params, config, serving_params, candidate)
    conductor, base = build_policies(conductor_params, config, candidate)
    warm_start = warm_start_policy(conductor, conductor_params, config)
    champion = champion_policy(conductor, conductor_params, config)
    return ConductorsUnderTest(
        server=None, conductor=conductor, base=base, champion=champion, warm_start=warm_start
    )


def served_conductors(
    conductor_params: dict[str, Any],
    config: EvaluationConfig,
    serving_params: dict[str, Any] | None,
    candidate: str | None = None,
) -> ConductorsUnderTest:
    """Plan the policy server for an evaluation: the Conductor under test (resolved as in
    :func:`build_policies`), the champion (unless it is the one under test) and the warm
    start each become a LoRA module named after its version (``conductor-v3``), and the
    base-policy asks for the base model by its served name. The variants are those of the
    in-process evaluation (``conductor/3``), so promotion decides on the version measured."""
    from conductor_pipeline.serving.models import resolve_served_model
    from conductor_pipeline.serving.policy_server import (
        VllmPolicyServer,
        VllmSettings,
        versioned_lora_name,
    )

    policy_params = dict(conductor_params.get("policy") or {})
    if policy_params.get("kind", "local") == "scripted":
        raise ValueError(
            "evaluation.policy_server: vllm serves model adapters; a scripted Conductor "
            "(conductor.policy.kind: scripted) has none"
        )
    settings = VllmSettings.from_mapping(dict((serving_params or {}).get("vllm") or {}))
    explicit = config.conductor.adapter is not None or candidate is not None
    reference = config.conductor.adapter or candidate or policy_params.get("adapter")
    served = resolve_served_model(reference, explicit=explicit, root=project_root())

    modules: dict[str, str] = {}
    names: dict[str, str] = {}  # system -> served name of its adapter
    labels: dict[str, tuple[str, str, str]] = {}  # system -> (variant, label, adapter_dir)
    if served.adapter_dir is not None:
        if served.version == "adapter":
            digest = _folder_digest(served.adapter_dir, skip=WARM_START_DIR)
            variant, label = f"adapter:{digest}", f"adapter folder {served.adapter_dir}"
            names["conductor"] = versioned_lora_name(settings.lora_name, f"adapter-{digest}")
        else:
            variant = served.id
            label = f"{served.reference} (version {served.version})"
            names["conductor"] = versioned_lora_name(settings.lora_name, f"v{served.version}")
        modules[names["conductor"]] = served.adapter_dir
        labels["conductor"] = (variant, label, served.adapter_dir)
        folder = Path(served.adapter_dir) / WARM_START_DIR
        if config.wants("warm-start") and (folder / "adapter_config.json").is_file():
            names["warm-start"] = f"{names['conductor']}-warm-start"
            modules[names["warm-start"]] = str(folder)
            labels["warm-start"] = (
                f"warm-start:{_folder_digest(str(folder))}",
                f"warm-start (SFT-only) adapter of {label}",
                str(folder),
            )
    if config.wants("champion"):
        champion = _champion()
        under_test = labels.get("conductor", ("",))[0]
        if champion.adapter_dir is not None and champion.id != under_test:
            names["champion"] = versioned_lora_name(settings.lora_name, f"v{champion.version}")
            modules[names["champion"]] = champion.adapter_dir
            labels["champion"] = (
                champion.id,
                f"champion {champion.reference} (version {champion.version})",
                champion.adapter_dir,
            )
        else:
            logger.info("evaluation: champion skipped: none registered, or it is under test")

    server = VllmPolicyServer(settings, None, lora_modules=modules)
    base_id = "base:" + fingerprint({"policy_server": "vllm", "base_model": settings.base_model})
    base = PolicyUnderTest(
        server.endpoint(server.base_name),
        base_id,
        f"untrained base policy ({settings.base_model}, served as {server.base_name})",
    )

    def put(system: str) -> PolicyUnderTest | None:
        if system not in names:
            return None
        variant, label, folder = labels[system]
        return PolicyUnderTest(server.endpoint(names[system]), variant, label, adapter_dir=folder)

    conductor = put("conductor")
    if conductor is None:
        note = (
            f"no trained adapter: {reference or 'no adapter configured'} does not resolve, "
            "so the untrained base policy is evaluated as the conductor"
        )
        logger.warning("evaluation: %s", note)
        conductor = PolicyUnderTest(base.policy, base_id, f"BASE POLICY ({note})")
    return ConductorsUnderTest(
        server=server,
        conductor=conductor,
        base=base if config.wants("base-policy") else None,
        champion=put("champion"),
        warm_start=put("warm-start"),
    )
