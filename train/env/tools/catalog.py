"""A price catalog: the number a task needs but the model cannot know, so it must look it up first.

Stateless and deterministic: the price of an item is a function of its name (data_prep/tool_math.py
`price_of`, which computes the chained task's golds with it: look up a price, then multiply it with the
calculator, two calls in sequence).
"""

from __future__ import annotations

from data_prep.tool_math import ITEMS, price_of
from train.env.base import ToolError, one_argument_schema


class Catalog:
    name = "catalog"

    def schema(self) -> dict:
        return one_argument_schema(
            self.name, "Look up the price of an item in cents.", "item", "the item's name, e.g. blue widget"
        )

    def __call__(self, item: str = "") -> str:
        if not isinstance(item, str) or item.strip().lower() not in ITEMS:
            raise ToolError(f"no item {item!r} in the catalog (items: {', '.join(ITEMS)})")
        return str(price_of(item))
