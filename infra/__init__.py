"""CDK constructs of Punctual: one construct per capability, composed by the stack."""
