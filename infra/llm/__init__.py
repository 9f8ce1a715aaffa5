"""LLM API access shared by every judge: one client (openai / anthropic SDKs) with retries and a reply cache."""

from infra.llm.client import LLMClient, LLMClientError, parse_model

__all__ = ["LLMClient", "LLMClientError", "parse_model"]
