"""Rule and territory models of the org YAML, and the SLA a rule or a team sets.

``connector.core.config`` holds the whole file's model and re-exports these; the conditions'
own syntax is ``connector.core.rule_syntax``, the territory tables ``connector.core.territories``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from connector.core.rule_syntax import (
    FIELD_NAME,
    Condition,
    ConditionError,
    FieldType,
    fields_of,
    parse_when,
)
from connector.core.territories import Table, build_table


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sla(_Model):
    """A lead still in one of the ``initial`` values of ``status_field`` this many minutes
    after its assignment (read from the CRM by the poll) is re-routed once."""

    minutes: Annotated[int, Field(ge=1, le=525_600)]
    status_field: str
    initial: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]

    @field_validator("status_field")
    @classmethod
    def _field_name(cls, value: str) -> str:
        if not FIELD_NAME.match(value):
            raise ValueError("not a CRM field name (letters, digits and _ only)")
        return value


FieldValues = str | int | float | bool | list[str | int | float | bool]


class Rule(_Model):
    """Route to ``team`` when the lead satisfies ``when`` (see ``connector.core.rule_syntax``:
    ``Field: [values]`` is the original form, equals one of them); no ``when`` matches
    everything (the default rule). With ``territory`` the team is the one the named
    territory table gives the lead, and the rule does not match a lead the table has no row
    for. With ``route_to: account_owner`` the lead goes to the owner of its Account
    (Salesforce) or Company (HubSpot) when one matches, and to the rule's team otherwise
    (see connector/routing/domains.py)."""

    team: str | None = None
    name: str | None = None
    # A field's type (text, number, date, multi) where the operators would not say it.
    types: dict[str, FieldType] | None = None
    when: dict[str, Any] | None = None
    territory: str | None = None
    # Overrides the team's `sla` for leads this rule routes.
    sla: Sla | None = None
    route_to: Literal["team", "account_owner"] = "team"
    _condition: Condition | None = PrivateAttr(default=None)

    @field_validator("when")
    @classmethod
    def _non_empty(cls, when: dict[str, Any] | None) -> dict[str, Any] | None:
        if when is not None and not when:
            raise ValueError("`when` must name at least one field; omit it for a default rule")
        return when

    @field_validator("types")
    @classmethod
    def _type_fields(cls, types: dict[str, FieldType] | None) -> dict[str, FieldType] | None:
        for key in types or {}:
            if not FIELD_NAME.match(key):
                raise ValueError(f"`{key}`: not a CRM field name (letters, digits and _ only)")
        return types

    @model_validator(mode="after")
    def _parse(self) -> Rule:
        if (self.team is None) == (self.territory is None):
            raise ValueError("name a `team`, or a `territory` whose rows name the teams (not both)")
        if self.when is not None:
            label = f"rule {self.name!r}" if self.name else ""
            self._condition = parse_when(self.when, self.types or {}, label)
        return self

    @property
    def condition(self) -> Condition | None:
        """``when`` as a tree (parsed at load)."""
        return self._condition

    @property
    def fields(self) -> list[str]:
        """The fields this rule reads (its territory's are the table's)."""
        return fields_of(self._condition) if self._condition is not None else []


class TerritoryFields(_Model):
    """The lead fields a territory table reads."""

    country: str
    state: str | None = None
    postal_code: str | None = None

    @field_validator("country", "state", "postal_code")
    @classmethod
    def _field_name(cls, value: str | None) -> str | None:
        if value is not None and not FIELD_NAME.match(value):
            raise ValueError("not a CRM field name (letters, digits and _ only)")
        return value


class Territory(_Model):
    """A table from country, state and postal code to a team (connector.core.territories):
    ``rows`` written inline, or ``file``, a CSV next to the config with the columns
    country, state, postal_code, team (the loader reads it into ``rows``)."""

    fields: TerritoryFields
    file: str | None = None
    rows: list[dict[str, str | int | None]] | None = None
    _table: Table | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _build(self) -> Territory:
        if self.rows is None:
            raise ValueError("write its `rows`, or name a CSV `file` next to the config")
        if self.file is not None:
            wheres = [f"{self.file}:{i + 2}" for i in range(len(self.rows))]
        else:
            wheres = [f"rows[{i}]" for i in range(len(self.rows))]
        if not self.rows:
            raise ValueError("has no rows")
        built = build_table(self.rows, wheres)
        if isinstance(built, str):
            if self.file is None:  # name the first row at fault by its line in the file
                for i, where in enumerate(wheres):
                    if built.startswith((f"{where}:", f"{where} ")):
                        raise ConditionError([(("rows", i), built)])
            raise ValueError(built)
        if self.fields.state is None and any(r.state for r in built.rows):
            raise ValueError("rows name a state: set fields.state")
        if self.fields.postal_code is None and any(r.postal for r in built.rows):
            raise ValueError("rows name a postal code: set fields.postal_code")
        self._table = built
        return self

    @property
    def table(self) -> Table:
        assert self._table is not None
        return self._table

    @property
    def read(self) -> list[str]:
        """The lead fields this table reads."""
        f = self.fields
        return [n for n in (f.country, f.state, f.postal_code) if n is not None]
