"""The judge client built from the --judge-* options: one place for the suite and for --rate."""

from __future__ import annotations

import argparse


def judge_client(args: argparse.Namespace):
    """An LLMClient for `args.judge_model` with the --judge-* connection options (raises LLMClientError/
    ValueError on a bad model name or a missing key, for the caller to turn into its one-line error)."""
    from infra.llm.client import LLMClient

    return LLMClient(
        args.judge_model,
        base_url=args.judge_base_url,
        api_key_env=args.judge_api_key_env,
        timeout_s=args.judge_timeout,
        max_retries=args.judge_retries,
        cache_dir=args.judge_cache_dir,
    )
