"""The gRPC layer: servicers, conversions and error mapping. The only user of generated code."""
