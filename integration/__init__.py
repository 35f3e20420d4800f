"""Integrations of the DDTree kernels into real services: SGLang drop-ins and the import hook."""
