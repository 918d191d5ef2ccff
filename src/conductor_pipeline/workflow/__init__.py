"""The domain core: workflows as data, parsing, prompt rendering and async execution.

No Kedro or MLflow imports here; usable directly from a notebook::

    from conductor_pipeline.workflow import parse_workflow, execute_workflow
"""

from conductor_pipeline.workflow.executor import (
    Budget,
    ExecutionResult,
    StepRecord,
    execute_workflow,
    prior_steps,
)
from conductor_pipeline.workflow.orchestrator import (
    ConductorCall,
    OrchestrationConfig,
    OrchestrationResult,
    RoundRecord,
    orchestrate,
)
from conductor_pipeline.workflow.parser import (
    attempted_steps,
    parse_workflow,
    render_workflow,
    workflow_from_lists,
)
from conductor_pipeline.workflow.policy import (
    ConductorPolicy,
    EndpointPolicy,
    LocalPolicy,
    PolicyCompletion,
)
from conductor_pipeline.workflow.prompts import (
    DEFAULT_FEW_SHOT,
    FewShotExample,
    PriorStep,
    PromptConfig,
    conductor_messages,
    recursion_messages,
    shown_worker_descriptions,
    worker_messages,
)
from conductor_pipeline.workflow.shapes import SHAPES, WorkflowShape, workflow_shape
from conductor_pipeline.workflow.types import (
    ParseLimits,
    Step,
    UnequalListsError,
    Workflow,
    WorkflowParseError,
)

__all__ = [
    "DEFAULT_FEW_SHOT",
    "Budget",
    "ConductorCall",
    "ConductorPolicy",
    "EndpointPolicy",
    "LocalPolicy",
    "OrchestrationConfig",
    "OrchestrationResult",
    "PolicyCompletion",
    "RoundRecord",
    "orchestrate",
    "ExecutionResult",
    "FewShotExample",
    "ParseLimits",
    "PriorStep",
    "PromptConfig",
    "SHAPES",
    "Step",
    "StepRecord",
    "Workflow",
    "UnequalListsError",
    "WorkflowParseError",
    "attempted_steps",
    "WorkflowShape",
    "conductor_messages",
    "execute_workflow",
    "parse_workflow",
    "prior_steps",
    "recursion_messages",
    "shown_worker_descriptions",
    "render_workflow",
    "worker_messages",
    "workflow_from_lists",
    "workflow_shape",
]
