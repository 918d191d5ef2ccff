from conductor_pipeline.pipelines.promotion.pipeline import create_pipeline

__all__ = ["create_pipeline"]
