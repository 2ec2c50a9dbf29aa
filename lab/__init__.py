"""The engine of PagedAttention Lab: importable without Streamlit."""
