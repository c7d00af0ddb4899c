"""The SchedulingPolicy: its model (``model``), YAML in and out (``yaml_io``), validation with every
error and warning at once (``validate``, ``checker``, ``schema``, ``errors``), credentials ->
identities (``identities``) and the built-in policy (``defaults``). Import from the submodule.
"""
