"""tfplan: plan schedule-aware parameter freezing for pipeline-parallel training.

Pure Python (networkx, ortools, numpy, rich, typer); never imports torch.
Data flow: profile JSON -> schedule (torch's action grammar) -> DAG -> simulate / LP -> plan JSON.
"""

__version__ = "0.1.0"
