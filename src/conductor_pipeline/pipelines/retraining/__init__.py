from conductor_pipeline.pipelines.retraining.pipeline import create_pipeline

__all__ = ["create_pipeline"]
