"""Logger, Tracer and Metrics: created once here, imported everywhere."""

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="punctual")
tracer = Tracer(service="punctual")
metrics = Metrics(namespace="Punctual", service="punctual")
