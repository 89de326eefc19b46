"""How states are shown in prompts."""

from __future__ import annotations


def test_a_large_state_shown_for_a_call_keeps_the_record_the_call_names() -> None:
    from synthesis.llm.prompts import shown
    from synthesis.stages.states import focused

    permits = {f"PP-{n:04d}": {"permit_id": f"PP-{n:04d}", "plate": f"KX{n:02d} TRV", "status": "active"} for n in range(200)}
    state = {"permits": permits, "zones": {"Z1": {"fee": 30}}, "next_id": 201}
    view = focused(state, {"permit_id": "PP-0187"})
    assert view["permits"]["PP-0187"]["plate"] == "KX187 TRV" and view["next_id"] == 201
    assert view["permits"]["..."] == "199 other records not shown" and view["zones"] == {"...": "1 other records not shown"}
    assert '"PP-0187"' in shown(view, 4000) and '"PP-0187"' not in shown(state, 2500)  # what the plain cut hid
    small = {"permits": {"PP-0001": permits["PP-0001"]}}
    assert focused(small, {"permit_id": "PP-0001"}) == small  # a state that fits is shown whole
