from conductor_pipeline.pipelines.data_prep.pipeline import create_pipeline

__all__ = ["create_pipeline"]
