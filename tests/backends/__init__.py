"""Tests of what is specific to one durable backend."""
