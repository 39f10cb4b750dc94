"""Small interfaces to AWS services other than DynamoDB."""
