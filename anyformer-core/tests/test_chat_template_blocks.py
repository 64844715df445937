"""``render_chat(blocks=True)``: a multimodal template sees a message's blocks, as transformers' processors pass them.

Without it, text blocks are joined by newlines and media blocks vanish from what the template sees (the
backends put a stand-in text where each was); with it, the template gets the list of blocks, each media
block reduced to its kind, and writes its own placeholder where the block sits.
"""

from __future__ import annotations

from anyformer import render_chat

#: A template in the style of Qwen2-VL's and Qwen2-Audio's: it walks list content and writes each kind's tokens.
BLOCK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif block['type'] == 'audio' %}Audio: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [
            {"type": "image", "image": b"\x89PNG not really"},
            {"type": "text", "text": "What is this?"},
            {"type": "audio", "audio": b"RIFF not really"},
            {"type": "text", "text": "And this?"},
        ],
    },
]


def test_blocks_reach_a_multimodal_template_in_their_order() -> None:
    got = render_chat(BLOCK_TEMPLATE, MESSAGES, blocks=True)
    assert got == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>What is this?Audio: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
        "And this?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_without_blocks_the_template_sees_the_joined_text() -> None:
    got = render_chat(BLOCK_TEMPLATE, MESSAGES)
    assert "<|image_pad|>" not in got and "<|AUDIO|>" not in got
    assert "What is this?\nAnd this?" in got


def test_a_blocks_data_never_reaches_the_template() -> None:
    """A template that prints the content itself sees each media block as its kind alone."""
    got = render_chat("{% for m in messages %}{{ m['content'] }}|{% endfor %}", MESSAGES, blocks=True)
    assert "not really" not in got
    assert "{'type': 'image'}" in got and "{'type': 'audio'}" in got and "'What is this?'" in got
