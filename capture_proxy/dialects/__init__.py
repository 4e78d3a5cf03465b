"""Agent dialects other than chat completions, translated onto the proxy's own chat capture path.

Anthropic's Messages API (`POST /v1/messages`, `anthropic_messages`) and OpenAI's Responses API
(`POST /v1/responses`, `openai_responses`) arrive here; each request becomes the chat-completions call
the engine understands, goes through exactly the path a chat call takes (admission, the engine, the
recorded turn with the engine's token ids, logprobs and mask), and the reply, stream or error goes back
in the agent's own format (`bridge`). A turn captured this way is a chat turn like any other, with
`metadata.dialect` saying which API the agent spoke.
"""

from capture_proxy.dialects.anthropic_messages import ANTHROPIC_MESSAGES
from capture_proxy.dialects.base import Dialect, DialectStream
from capture_proxy.dialects.bridge import translate_call
from capture_proxy.dialects.openai_responses import OPENAI_RESPONSES

__all__ = ["ANTHROPIC_MESSAGES", "OPENAI_RESPONSES", "Dialect", "DialectStream", "translate_call"]
