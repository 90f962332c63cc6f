"""`Strict`: the base of every section of the policy schema.

An unknown key is an error, never ignored (the loader reports it with its
line), and a loaded section is frozen: the policy in force is read by many
requests at once and replaced whole on reload, never edited.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
