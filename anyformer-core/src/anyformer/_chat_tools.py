"""Tools into a chat template's render, the same way for every backend that renders templates itself.

A template that reads ``tools`` gets them as a variable (transformers' shape); one that does not
gets them described in the system message, but only for a forced call (``tool_choice`` required or
a named function: the constraint then holds the reply to a valid call); with ``tool_choice`` auto
the model would never see them, so that is refused (``BAD_REQUEST``) rather than ignored.
"""

from __future__ import annotations

from typing import Any

from anyformer._chat_template import template_takes_tools
from anyformer.contract._chunk import GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._messages import Message
from anyformer.contract._tool_calls import with_tool_prompt


def tools_for_template(
    template: str | None, messages: list[Message], options: GenerateOptions, model: str
) -> tuple[list[Message], dict[str, Any]]:
    """The messages to render and the extra template variables (``tools``) for ``options``' tools.

    ``model`` names the model in the refusal. Without tools the messages come back as given, with no
    variables.
    """
    if not options.tools:
        return messages, {}
    if template_takes_tools(template):
        return messages, {"tools": [dict(tool) for tool in options.tools]}
    if options.tool_choice == "auto":
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"tools: the chat template of {model} does not render tools, so with tool_choice 'auto' the model "
            "would never see them; send tool_choice 'required' or a named function (the call is then "
            "constrained), or use a model whose template takes tools",
        )
    return with_tool_prompt(messages, options.tools), {}
