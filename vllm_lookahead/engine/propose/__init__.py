"""What the next step drafts: eligibility, per-request settings, room, the live-request record, the measured
step cost, draft-free admission steps."""
