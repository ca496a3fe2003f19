"""`format` schemas compiled as Ollama compiles them (llama.cpp's json-schema-to-grammar semantics), checked with
llguidance's own matcher over a one-byte-per-token vocabulary: which JSON texts the grammar accepts."""
from __future__ import annotations

import copy
import re
import json

import llguidance as llg
import pytest
from pydantic import BaseModel

from evenflow.daemon.engine.grammar import GrammarError, grammar_for_format
from evenflow.daemon.engine.json_schema import MAX_INTEGER

BYTES = llg.LLTokenizer("byte")


def accepts(fmt: object, text: str) -> bool:
    """Whether the grammar for `fmt` accepts exactly `text` as a whole output."""
    m = llg.LLMatcher(BYTES, grammar_for_format(fmt), log_level=0)
    assert not m.is_error(), m.get_error()
    ids = BYTES.tokenize_bytes(text.encode())
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


class Pet(BaseModel):
    name: str
    age: int


class Owner(BaseModel):
    name: str
    pets: list[Pet]
    nickname: str | None = None


def test_pydantic_objects_are_closed_at_every_level() -> None:
    schema = Owner.model_json_schema()  # no additionalProperties anywhere, as pydantic writes it
    assert "additionalProperties" not in json.dumps(schema)
    assert accepts(schema, '{"name": "Al", "pets": [{"name": "Rex", "age": 3}]}')
    assert accepts(schema, '{"name": "Al", "pets": [], "nickname": null}')
    assert not accepts(schema, '{"name": "Al", "pets": [], "extra": 1}')
    assert not accepts(schema, '{"name": "Al", "pets": [{"name": "Rex", "age": 3, "color": "red"}]}')


def test_additional_properties_true_or_a_schema_allows_other_keys() -> None:
    props = {"a": {"type": "integer"}}
    assert accepts({"type": "object", "properties": props, "additionalProperties": True}, '{"a": 1, "b": [true]}')
    typed = {"type": "object", "properties": props, "additionalProperties": {"type": "string"}}
    assert accepts(typed, '{"a": 1, "b": "x"}') and not accepts(typed, '{"a": 1, "b": 2}')
    assert accepts({"type": "object"}, '{"anything": {"goes": [1, "x"]}}')  # no properties: a free object
    assert accepts("json", '{"k": [1, 2]}')


def test_integers_have_at_most_16_digits_as_in_llama_cpp() -> None:
    for schema in ({"type": "integer"}, {"type": "integer", "minimum": 0}, {"type": ["integer", "null"]}):
        assert accepts(schema, str(MAX_INTEGER)) and accepts(schema, "0"), schema
        assert not accepts(schema, "1" + "0" * 16), schema
    assert accepts({"type": "integer"}, f"-{MAX_INTEGER}") and not accepts({"type": "integer"}, "-1" + "0" * 16)
    assert accepts({"type": "integer", "maximum": 10}, "-5") and not accepts({"type": "integer", "maximum": 10}, "11")
    assert not accepts({"type": "integer", "minimum": 3, "maximum": 5}, "6")  # the schema's own bounds still hold


def test_numbers_are_bounded_too() -> None:
    assert accepts({"type": "number"}, "-12.5") and accepts({"type": "number"}, "3.1415926535")
    assert not accepts({"type": "number"}, "1" * 17)  # integral part: 16 digits, as llama.cpp
    assert not accepts({"type": "number"}, "0." + "1" * 11)  # fraction: 10 digits (llama.cpp: 16)
    assert accepts({"type": "number", "minimum": 0, "maximum": 1}, "0.25")


def test_required_properties_come_first_as_in_llama_cpp() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["b"]}
    assert accepts(schema, '{"b": 1, "a": 2}') and accepts(schema, '{"b": 1}')
    assert not accepts(schema, '{"a": 2, "b": 1}')


def test_required_names_without_a_schema_are_ignored_not_unsatisfiable() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "ghost"]}
    assert accepts(schema, '{"a": 1}')  # llama.cpp only knows the properties it has; strict JSON Schema: never


def test_all_of_objects_merge_into_one_closed_object() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"$ref": "#/$defs/B"}],
              "$defs": {"B": {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}}}
    assert accepts(schema, '{"a": 1, "b": "x"}')
    assert not accepts(schema, '{"a": 1, "b": "x", "c": 2}')


def test_the_callers_schema_is_left_as_it_was() -> None:
    schema = Owner.model_json_schema()
    before = copy.deepcopy(schema)
    grammar_for_format(schema)
    assert schema == before


@pytest.mark.parametrize("schema,loop", [
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "#"),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}, "required": ["next"]}},
      "$ref": "#/$defs/N"}, "#/$defs/N"),
    ({"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                "B": {"type": "array", "items": {"$ref": "#/$defs/A"}, "minItems": 1}}, "$ref": "#/$defs/A"},
     "#/$defs/A"),
])
def test_a_schema_that_requires_itself_is_refused(schema: dict, loop: str) -> None:
    with pytest.raises(GrammarError, match="no finite JSON value satisfies this schema.*" + re.escape(f'"$ref": "{loop}"')):
        grammar_for_format(schema)


def test_recursion_with_a_way_out_compiles_and_works() -> None:
    tree = {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["v"]}
    assert accepts(tree, '{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}')
    assert not accepts(tree, '{"v": 1, "kids": [{"v": 2, "x": 0}]}')
    optional = {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["a"]}
    assert accepts(optional, '{"a": {"a": null}}')
