"""Public fakes for testing code built on keel (and keel itself): a scripted provider and loopback
servers that speak each provider's wire API on 127.0.0.1. Nothing here reaches the network.

- `ScriptedProvider`: an in-process provider that plays a script and fails loudly on divergence.
- `keel.testing.anthropic_server.AnthropicServer`, `keel.testing.openai_server.OpenAIResponsesServer`
  and `OpenAIChatServer`, `keel.testing.gemini_server.GeminiServer` and
  `keel.testing.ollama_server.OllamaServer`: real HTTP servers on 127.0.0.1 (imported from their
  modules); `keel.testing.llamacpp_server.LlamaCppServer` behaves as llama.cpp's server does
  (`n_ctx`, `/props`, its overflow error, its prefix cache).
- `Reply`, `Fault`, `reply`: the script language both use.
- `keel.testing.classifier.RuleClassifier`: a scripted auto-mode classifier that answers by a
  fixed list of rules (imported from its module).
"""

from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Fault, Reply, ScriptDivergence, Step, reply

__all__ = ["Fault", "Reply", "ScriptDivergence", "ScriptedProvider", "Step", "reply"]
