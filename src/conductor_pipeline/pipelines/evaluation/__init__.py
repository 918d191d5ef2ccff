from conductor_pipeline.pipelines.evaluation.pipeline import create_pipeline

__all__ = ["create_pipeline"]
