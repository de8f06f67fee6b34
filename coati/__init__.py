"""coati: aligning language models with human feedback and verifiable rewards on ColossalAI."""

__version__ = "0.1.0"
