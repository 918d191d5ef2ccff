"""The sandbox worker pool: simulated workers and a real small LLM behind an OpenAI-style API.

See ``conf/base/sandbox_workers.yml`` for the worker profiles. Typical use::

    from conductor_pipeline.workers.sandbox import SandboxServer

    with SandboxServer(tasks_paths=[...], latency_scale=0.0) as sandbox:
        workers = sandbox.pool_config()   # entries for the litellm pool
"""

from conductor_pipeline.workers.sandbox.profiles import (
    ProfileError,
    RealProfile,
    SandboxProfiles,
    SimulatedProfile,
    default_profiles_path,
    load_profiles,
    parse_profiles,
    sandbox_pool_config,
)
from conductor_pipeline.workers.sandbox.questions import (
    UNKNOWN_QUESTION_WARNING,
    QuestionCheck,
    SandboxQuestionCheck,
    recognise,
)
from conductor_pipeline.workers.sandbox.server import (
    SandboxServer,
    SandboxStartError,
    create_app,
    load_tasks,
    serve,
)
from conductor_pipeline.workers.sandbox.simulated import SimulatedWorker, TaskIndex

__all__ = [
    "UNKNOWN_QUESTION_WARNING",
    "ProfileError",
    "QuestionCheck",
    "RealProfile",
    "SandboxProfiles",
    "SandboxQuestionCheck",
    "SandboxServer",
    "SandboxStartError",
    "SimulatedProfile",
    "SimulatedWorker",
    "TaskIndex",
    "create_app",
    "default_profiles_path",
    "load_profiles",
    "load_tasks",
    "parse_profiles",
    "recognise",
    "sandbox_pool_config",
    "serve",
]
