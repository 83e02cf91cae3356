"""Tool schemas derived from type hints + Google docstrings equal transformers' get_json_schema."""
import enum
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import pytest

from mindrlhf.tools.schema import SchemaError, function_schema, parse_google_docstring

get_json_schema = pytest.importorskip("transformers.utils").get_json_schema


def basic(a: int, b: float, c: str, d: bool):
    """Four basic types.

    Args:
        a: an integer
        b: a float
        c: a string
        d: a flag
    """


def with_defaults(x: int, y: int = 2, label: str = "sum", verbose: bool = False) -> int:
    """
    Adds two numbers.

    A second paragraph of description.

    Args:
        x: The first number.
        y: The second number, whose description
            runs over two lines.
        label (str): a name for the result
        verbose: say more

    Returns:
        The sum of x and y.
    """
    return x + y


def containers(xs: list[int], names: List[str], pair: Tuple[int, str], table: Dict[str, float],
               bag: dict, items: list, anything: Any):
    """Containers.

    Args:
        xs: integers
        names: strings
        pair: an int and a string
        table: name -> value
        bag: any object
        items: any list
        anything: whatever
    """


def optionals(a: Optional[int] = None, b: Union[int, str] = 1, c: Optional[list[int]] = None,
              d: Union[int, list[str]] = 0, e: int | None = None, f: float | str = 1.0):
    """Optionals and unions.

    Args:
        a: maybe an int
        b: an int or a string
        c: maybe integers
        d: an int or strings
        e: PEP 604 optional
        f: PEP 604 union
    """


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


def choices(mode: Literal["fast", "slow"], level: Literal[1, 2, 3] = 1, colour: Colour = Colour.RED,
            drink: str = "tea", mixed: Literal["a", 1] = "a"):
    """Enumerations.

    Args:
        mode: how fast
        level: how much
        colour: which colour
        drink: what to drink (choices: ["tea", "coffee"])
        mixed: a mixed literal
    """


def no_args() -> str:
    """Takes nothing and says so."""
    return "nothing"


def returns_odd() -> object:
    """A return hint JSON cannot express is left out.

    Returns:
        an object
    """


class Calculator:
    def multiply(self, x: float, y: float) -> float:
        """Multiplies.

        Args:
            x: first
            y: second

        Raises:
            ValueError: never
        """
        return x * y


@pytest.mark.parametrize("fn", [basic, with_defaults, containers, optionals, choices, no_args, returns_odd,
                                Calculator().multiply, Calculator.multiply],
                         ids=["basic", "defaults", "containers", "optionals", "choices", "no_args", "returns_odd",
                              "bound_method", "method"])
def test_schema_equals_transformers(fn):
    assert function_schema(fn) == get_json_schema(fn)


def test_schema_shape_for_the_chat_template():
    s = function_schema(with_defaults)
    assert s["type"] == "function"
    f = s["function"]
    assert f["name"] == "with_defaults" and f["description"].startswith("Adds two numbers.")
    assert f["parameters"]["required"] == ["x"]
    assert f["parameters"]["properties"]["y"] == {"type": "integer", "description": "The second number, whose "
                                                  "description runs over two lines."}


def no_doc(x: int):
    return x


def missing_arg_doc(x: int, y: int):
    """Only one described.

    Args:
        x: the x
    """


def missing_hint(x, y: int):
    """No hint for x.

    Args:
        x: the x
        y: the y
    """


class Custom:
    pass


def custom_type(x: Custom):
    """A class JSON cannot express.

    Args:
        x: the x
    """


def star_args(*values: int):
    """Variadic.

    Args:
        values: the values
    """


@pytest.mark.parametrize("fn,words", [(no_doc, ["no_doc", "no docstring"]),
                                      (missing_arg_doc, ["missing_arg_doc", "'y'"]),
                                      (missing_hint, ["missing_hint", "'x'", "type hint"]),
                                      (custom_type, ["custom_type", "'x'", "Custom"]),
                                      (star_args, ["star_args", "values"])])
def test_schema_errors_name_the_function_and_argument(fn, words):
    with pytest.raises(SchemaError) as err:
        function_schema(fn)
    for w in words:
        assert w in str(err.value)
    if fn is not star_args:         # transformers refuses the same functions
        with pytest.raises(Exception):
            get_json_schema(fn)


def test_docstring_sections():
    summary, args, returns = parse_google_docstring("Summary.\n\nArgs:\n    a: first\n        more\n    b (int): "
                                                    "second\n\nReturns:\n    a value\n\nRaises:\n    X: never")
    assert summary == "Summary."
    assert args == {"a": "first more", "b": "second"}
    assert returns == "a value"


def test_rlhf_data_prompts_offer_the_tools_as_transformers_renders_them(tmp_path):
    """`rlhf_data.py --prompt_template chat --tool_module tools.py`: every prompt in the MindRecord is the
    tokens of transformers' apply_chat_template(messages, tools=[the functions], add_generation_prompt=True),
    the tools loaded as the trainer loads tools.tool_module; the flag is refused without a chat template."""
    import os
    import shutil
    import numpy as np
    from mindspore.mindrecord import FileReader
    from transformers import Qwen2Tokenizer
    from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
    from mindrlhf.configs import ConfigError
    from mindrlhf.data.convert import build_parser, convert
    from mindrlhf.data.tokenizer import load_qwen2_tokenizer
    vocab, merges = make_tokenizer_files(str(tmp_path / "tok"))
    template = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_chat_template.jinja")
    shutil.copy(template, tmp_path / "tok" / "chat_template.jinja")
    load_qwen2_tokenizer(vocab, merges)._tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "calc.py").write_text('''
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


TOOLS = [add]
''')
    rows = arithmetic_rows(3)
    src = write_jsonl(str(tmp_path / "q.jsonl"), rows)
    args = ["--vocab_path", str(tmp_path / "tok"), "--file_path", src, "--prompt_template", "chat",
            "--max_prompt_length", "1024", "--seq_length", "1100", "--no_progress",
            "--tool_module", str(tmp_path / "calc.py")]
    convert(build_parser().parse_args(args + ["--output_path", str(tmp_path / "out.mindrecord")]))
    namespace = {}
    exec((tmp_path / "calc.py").read_text(), namespace)
    tok, ours = Qwen2Tokenizer(vocab=vocab, merges=merges), load_qwen2_tokenizer(vocab, merges)
    reader = FileReader(str(tmp_path / "out.mindrecord"))
    got = list(reader.get_next())
    reader.close()
    assert len(got) == len(rows)
    for row, example in zip(got, rows):
        text = tok.apply_chat_template([{"role": "user", "content": example["question"]}], tools=[namespace["add"]],
                                       tokenize=False, add_generation_prompt=True, chat_template=open(template).read())
        assert '"name": "add"' in text
        ids = np.asarray(row["prompt_ids"])[:int(row["prompt_length"])]
        assert list(ids) == ours.encode(text) and ours.decode(list(ids), skip_special_tokens=False) == text
    with pytest.raises(ConfigError, match="--tool_module / --tool_config_path: .* --prompt_template chat"):
        convert(build_parser().parse_args(args[:4] + ["--prompt_template", "plain", "--tool_module",
                                                      str(tmp_path / "calc.py"), "--output_path",
                                                      str(tmp_path / "o2.mindrecord"), "--no_progress"]))
