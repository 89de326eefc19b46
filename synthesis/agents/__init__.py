"""The two agents of the dual-agent assessment: the tester that calls tools, the checker that labels each call."""
