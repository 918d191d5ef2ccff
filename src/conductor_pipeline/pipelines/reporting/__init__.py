from conductor_pipeline.pipelines.reporting.pipeline import create_pipeline

__all__ = ["create_pipeline"]
