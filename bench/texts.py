"""The texts every benchmark speaks (run.py, playback.py, memory.py)."""

from __future__ import annotations

# Home-automation announcements of about 2, 7, 11 and 38 seconds with the
# benchmark voice (~3 frames of 512 samples at 44.1 kHz per symbol).  No digits
# or Latin letters: the two front ends read those differently.
TEXTS: list[tuple[str, str]] = [
    ("short", "玄関の鍵を閉めました。"),
    ("medium", "洗濯機の運転が終わりました。しわにならないうちに、乾燥機に移すのを忘れないでください。"),
    ("long", "おはようございます。今日の天気は晴れのち曇り、最高気温は二十八度の予想です。"
             "夕方から雨が降るので、傘を持って出かけてください。"),
    ("very long",
     "おかえりなさい。リビングのエアコンを冷房二十六度でつけておきました。"
     "玄関の鍵は閉まっています。お風呂はあと十分ほどで沸きます。"
     "今日は燃えるゴミの日でしたが、ゴミはまだ出されていないようです。"
     "明日の朝は七時に起こします。寝室の照明は十一時に自動で消えます。"
     "洗濯物が外に干したままになっています。夜から雨の予報なので、取り込んでおいてください。"
     "冷蔵庫の牛乳が少なくなっています。明日の買い物リストに追加しました。"
     "それでは、ごゆっくりお過ごしください。今日も一日お疲れさまでした。"),
]
