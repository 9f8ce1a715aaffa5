"""Datasets as Parquet files with one schema (see data_prep/schema.py and data_prep/README.md)."""
