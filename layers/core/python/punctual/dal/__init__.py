"""DynamoDB access: one module per table or concern. Item shapes live here only."""
