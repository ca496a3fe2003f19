"""The base of every request body model (pydantic): unknown fields ignored, strict types; the number and keep_alive
field types the dialects share. Bodies are read by errors.parse_body."""
from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr

Number = Union[StrictInt, StrictFloat]
KeepAlive = Optional[Union[StrictInt, StrictFloat, StrictStr]]


class RequestModel(BaseModel):
    # Unknown fields are ignored (Go's decoder does the same); types are strict so "5" is not a bool.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=())
